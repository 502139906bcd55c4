"""Fleet commands that only read change nothing; a bad job fails with its own error instead of killing its
workers; a worker interrupted with Ctrl-C (a real SIGINT) gives its job back at once."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import kernels
from db import Store
from db.queue import JobQueue, JobSpec
from tuner.cli import main
from tuner.fleet import job_specs
from tuner.search import Budget, measured_trials, study_name

ROOT = Path(__file__).resolve().parents[2]
OLD_DB = ROOT / "tests" / "data" / "v1_tuner.db"
CPU = kernels.CPU


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_DB", "TUNER_RECORD")}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, XDG_CACHE_HOME=str(tmp_path / "cache"), TRITON_INTERPRET="1",
               TUNER_DB=f"sqlite:///{tmp_path / 'unused-default.db'}")
    return env


# Read-only commands ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["list", "--untuned"]])
def test_read_only_fleet_command_on_a_missing_database_creates_nothing(command, tmp_path: Path, monkeypatch,
                                                                       capsys) -> None:
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no" / "such.db"
    assert main([*command, "--db", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, says", [(["status"], "0 job(s)"),
                                           (["list", "--untuned"], "no recorded problem is left untuned")])
def test_read_only_fleet_command_leaves_an_old_database_byte_identical(command, says: str, tmp_path: Path,
                                                                       capsys) -> None:
    old = tmp_path / "old.db"
    shutil.copy(OLD_DB, old)
    before = old.read_bytes()
    assert main([*command, "--db", str(old)]) == 0
    assert says in capsys.readouterr().out
    assert old.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]


# A bad job -----------------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_a_job_for_an_unknown_kernel_fails_with_its_error_and_the_worker_goes_on(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    good = kernels.Problem.from_key("matmul", "fp16:nn:16x32x32")
    with Store(url) as store:
        queue = JobQueue(store)
        # The bad job is claimed first (higher priority): before the fix it ended the worker there.
        queue.enqueue([JobSpec(CPU.name, "no_such_kernel", "fp16:nn:16x32x32", 2, None, {}, 10.0)])
        queue.enqueue(job_specs([good], CPU, Budget(2), {"seed": 0}))
    run = subprocess.run([sys.executable, "-m", "tuner", "worker", "--device", "cpu", "--db", url], cwd=ROOT,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 done, 1 failed, 0 lost" in run.stdout
    with Store(url) as store:
        jobs = {job.spec.kernel: job for job in JobQueue(store).jobs()}
    bad = jobs["no_such_kernel"]
    assert bad.state == "failed" and bad.attempts == 1 and "no_such_kernel" in (bad.error or "")
    assert "lost" not in bad.error
    assert jobs["matmul"].state == "done"


def test_search_reports_each_failed_jobs_own_error(tmp_path: Path, monkeypatch, capsys) -> None:
    import tuner.fleet

    def crash(*args, **kwargs):
        raise RuntimeError("the benchmark harness crashed")

    monkeypatch.setattr(tuner.fleet, "tune_problem", crash)  # not storage: the search itself crashes
    device = kernels.current_device().alias
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert main(["search", "--device", device, "--shape", "16x32x32", "--trials", "1", "--db", url]) == 1
    out = capsys.readouterr().out
    assert "1 problem(s) failed:" in out and "found no correct config" not in out
    assert "matmul fp16:nn:16x32x32: RuntimeError: the benchmark harness crashed" in out
    assert "run the same command again to resume them" in out
    with Store(url) as store:
        (job,) = JobQueue(store).jobs()
    assert job.state == "failed" and "RuntimeError: the benchmark harness crashed" == job.error


# Ctrl-C ------------------------------------------------------------------------------------------------


def _measured(storage: optuna.storages.RDBStorage, problem: kernels.Problem) -> int:
    name = study_name(CPU, problem)
    if name not in {study.study_name for study in storage.get_all_studies()}:
        return 0
    return len(measured_trials(optuna.load_study(study_name=name, storage=storage)))


def test_worker_interrupted_by_sigint_gives_its_job_back_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    problem = kernels.Problem.from_key("matmul", "fp16:nn:16x32x32")
    with Store(url) as store:
        JobQueue(store).enqueue(job_specs([problem], CPU, Budget(500), {"seed": 0}))
    storage = optuna.storages.RDBStorage(url)
    log = tmp_path / "worker.log"
    argv = [sys.executable, "-m", "tuner", "worker", "--device", "cpu", "--db", url, "--lease", "600"]
    with log.open("w") as sink:
        worker = subprocess.Popen(argv, cwd=ROOT, env=_env(tmp_path), stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while _measured(storage, problem) < 1:
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        worker.send_signal(signal.SIGINT)
        # 60 s ran out once on a 2-core machine shared with another test run
        assert worker.wait(timeout=180) == 130, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    with Store(url) as store:
        queue = JobQueue(store)
        (job,) = queue.jobs()
        # Queued again, not running under a 600 s lease, and the interrupted claim is not counted as lost.
        assert (job.state, job.worker, job.lease_until, job.attempts) == ("queued", None, None, 0), log.read_text()
        again = queue.claim("next:1:0", CPU.name)
    assert again is not None and again.id == job.id and again.attempts == 1


def test_a_gpu_fault_stops_the_worker_rather_than_failing_the_job() -> None:
    """A CUDA error may leave the worker's context broken (every later job would fail there too), so it ends the
    worker as a crash would, and the job goes to another worker; a job's own error fails only the job. The
    messages are torch's; raising a real CUDA fault needs a GPU."""
    from tuner.errors import is_device_fault as _device_fault

    assert _device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert _device_fault(RuntimeError("CUDA error: device-side assert triggered"))
    assert not _device_fault(ValueError("unknown kernel 'no_such_kernel'; known kernels: matmul"))
    assert not _device_fault(RuntimeError("found no correct config"))


@pytest.mark.parametrize("text, visible, message", [
    ("0,2", 2, "this process sees 2 GPU(s), numbered from 0, so 2 is not one"),
    ("1", 1, "so 1 is not one"),
    ("0,0", 2, "names a GPU twice"),
    ("all", 0, "found no GPU"),
    ("all", None, "found no GPU"),
    ("0,x", 4, "must be 'all' or GPU indices"),
])
def test_gpus_past_what_this_process_sees_are_refused_by_name(text, visible, message) -> None:
    from tuner.gpu_workers import parse_gpus

    with pytest.raises(ValueError, match=re.escape(message)):
        parse_gpus(text, visible)


def test_gpus_on_gpus_and_as_labels_of_cpu_workers() -> None:
    from tuner.gpu_workers import parse_gpus

    assert parse_gpus("all", 2) == ["0", "1"]
    assert parse_gpus("1, 0", 2) == ["1", "0"]
    assert parse_gpus("0,7", None) == ["0", "7"]  # --device cpu: labels, no GPU to check against


def test_workers_named_by_index_start_before_the_run_imports_torch() -> None:
    # A fresh process, as `python -m tuner search --gpus 0,1` is one: torch is imported by the check of the
    # indices against the host's GPUs, after the (gated) workers were spawned; here that check refuses them
    # (no GPU in this process's view) and they are called off.
    code = """
import argparse, sys
from tuner import gpu_workers
from tuner.errors import UserError
seen = []
gpu_workers.spawn_gpu_workers = lambda *args, **kw: seen.append("torch" in sys.modules) or []
args = argparse.Namespace(gpus="0,1", device="auto", db="sqlite:///unused.db", lease=None, workers=None, ahead=4)
try:
    gpu_workers.started_early(args)
except UserError as exc:
    print("refused:", exc)
print("torch at spawn:", seen)
"""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU in its view, whatever this host has
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch at spawn: [False]" in done.stdout, done.stdout
    assert "refused: --gpus '0,1': this process sees 0 GPU(s)" in done.stdout, done.stdout


def _fresh_cli(code: str, tmp_path: Path) -> str:
    """Run ``code`` in a fresh process, as `python -m tuner ...` is one; its stdout."""
    env = {**_env(tmp_path), "CUDA_VISIBLE_DEVICES": ""}  # no GPU in its view, whatever this host has
    env.pop("TRITON_INTERPRET")  # the CLI sets it itself once it finds no GPU
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_search_gpus_on_auto_spawns_its_workers_before_the_cli_imports_torch(tmp_path: Path) -> None:
    # --device auto asks torch whether this host has a GPU; that import comes after the spawn, so the workers'
    # start-up overlaps it (before, it preceded the spawn: 4.2 s on 2 H200s, docs/FLEET.md).
    out = _fresh_cli("""
import sys
from tuner import gpu_workers
from tuner.cli import main
seen = []
gpu_workers.spawn_gpu_workers = lambda *args, **kw: seen.append("torch" in sys.modules) or []
code = main(["search", "--gpus", "0,1", "--shape", "16x16x16", "--db", "sqlite:///unused.db"])
print("exit", code, "torch at spawn:", seen)
""", tmp_path)
    assert "exit 2 torch at spawn: [False]" in out, out  # then refused: this process sees no GPU


def test_a_workers_compile_pool_starts_before_torch_and_closes_where_the_device_is_a_cpu(tmp_path: Path) -> None:
    # The pool's processes import torch, triton and kernels and make a CUDA context (seconds each): started first,
    # that overlaps the worker's own imports. Whether a GPU is there is guessed without torch (_gpu_likely: a test
    # double here, since this host may have none); the guess proven wrong by torch, the pool is closed unused.
    db = tmp_path / "fleet.db"
    out = _fresh_cli(f"""
import sys
import tuner.cli, tuner.workers as workers
events = []
workers.CheckPool.start = lambda self: events.append("started, torch imported: " + str("torch" in sys.modules))
workers.CheckPool.close = lambda self: events.append("closed")
tuner.cli._gpu_likely = lambda device: True
code = tuner.cli.main(["worker", "--db", "sqlite:///{db}"])
print("exit", code, events)
""", tmp_path)
    assert "exit 0 ['started, torch imported: False', 'closed'" in out, out


def test_the_early_pool_is_a_real_pool_for_gpu_commands_and_none_for_the_others() -> None:
    import argparse

    from tuner.cli import _early_pool, build_parser
    from tuner.workers import take_pool

    def parsed(*argv: str) -> argparse.Namespace:
        return build_parser().parse_args(list(argv))

    for argv in (["search", "--device", "cpu"], ["search", "--device", "h100", "--workers", "0"],
                 ["search", "--device", "h100", "--gpus", "0,1"], ["search", "--device", "h100", "--kernel", "m:k"],
                 ["worker", "--device", "cpu"], ["status"], ["verify", "--device", "h100"]):
        assert _early_pool(parsed(*argv)) is None, argv
    pool = _early_pool(parsed("worker", "--device", "h100", "--workers", "1"))  # a named GPU: no guess needed
    try:
        assert pool is not None and pool.workers == 1
        processes = list(pool._pool._processes.values()) + list(pool.timing._pool._processes.values())
        assert len(processes) == 2 and all(p.is_alive() for p in processes)
        assert take_pool(pool, wanted=True, size=4) is pool  # the command takes the one already started
        assert take_pool(pool, wanted=False, size=4) is None  # or closes it (a CPU device, --workers 0)
        for process in processes:
            process.join(timeout=60)
        assert not any(p.is_alive() for p in processes)
    finally:
        pool.close()


def test_a_worker_sees_the_gpu_its_index_names_among_this_processs_own() -> None:
    """With CUDA_VISIBLE_DEVICES=2,3 here, --gpus 0 is the host's GPU 2: index 0 of what this process sees."""
    from tuner.gpu_workers import child_visible_devices

    assert child_visible_devices("0", "2,3") == "2"
    assert child_visible_devices("1", " 2, 3 ") == "3"
    assert child_visible_devices("1", None) == "1"
    assert child_visible_devices("0", "") == "0"
    assert child_visible_devices("0", "GPU-5f1c,GPU-77aa") == "GPU-5f1c"  # UUIDs pass through as they are


def test_two_workers_with_one_host_pid_and_gpu_get_two_names(monkeypatch) -> None:
    """Containers sharing a host name, each with its worker as PID 1 on its GPU "0": the names still differ
    (the queue checks a job's owner by name alone)."""
    from tuner.fleet import worker_name

    monkeypatch.setattr(os, "getpid", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    device = kernels.current_device()
    first, second = worker_name(device), worker_name(device)
    assert first != second
    assert first.rsplit(":", 1)[1] == second.rsplit(":", 1)[1] == "0", "the GPU stays last"


# search --gpus starts its workers first, gated ---------------------------------------------------------------

def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_workers_started_before_a_bad_problems_file_is_read_touch_no_database_and_end(tmp_path: Path) -> None:
    # The run starts its workers before it reads --problems (their start-up overlaps its own); a typo there must
    # still create nothing, and the workers, never let go on, must end by themselves.
    db = tmp_path / "never.db"
    bad = tmp_path / "problems.txt"
    bad.write_text("matmul fp16:nn:16x16\n")
    done = subprocess.run([sys.executable, "-m", "tuner", "search", "--device", "cpu", "--gpus", "0,1",
                           "--problems", str(bad), "--db", f"sqlite:///{db}"], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--problems" in done.stderr, done.stderr
    deadline = time.monotonic() + 120
    while _processes_naming(str(db)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_naming(str(db)) == [], "the gated workers outlived the run that started them"
    assert not db.exists() and not list(tmp_path.glob("never.db*"))


def test_a_gated_worker_opens_its_database_only_once_told_to_go(tmp_path: Path) -> None:
    from tuner.gpu_workers import say_go, spawn_gpu_workers

    db = tmp_path / "gated.db"
    worker, = spawn_gpu_workers(f"sqlite:///{db}", ["0"], "cpu", ["--workers", "0"], gated=True)
    try:
        # Ungated, a worker with nothing queued creates its database and exits within its start-up (seconds).
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(timeout=20)
        assert not db.exists()
        say_go([worker])
        assert worker.wait(timeout=120) == 0  # no --wait: nothing queued, so it stops at once
        assert db.exists()
    finally:
        if worker.poll() is None:
            worker.kill()


def test_search_gpus_gives_each_worker_as_many_compile_processes_as_it_keeps_candidates_in_flight() -> None:
    import argparse

    from tuner.gpu_workers import worker_flags
    from tuner.workers import default_workers, search_workers

    def flags(**given) -> list[str]:
        return worker_flags(argparse.Namespace(**{"lease": None, "workers": None, "ahead": 4, **given}))

    assert flags() == ["--lease", "60.0", "--workers", "4"]  # the search's --ahead, not a pool per core
    assert flags(ahead=8) == ["--lease", "60.0", "--workers", "8"]
    assert flags(workers=0, ahead=8) == ["--lease", "60.0", "--workers", "0"]  # the user's --workers wins
    assert flags(ahead=None) == ["--lease", "60.0"]  # a run without --ahead (a user kernel's): the worker's default
    assert search_workers(4) == min(4, default_workers()) and search_workers(100) == default_workers()
