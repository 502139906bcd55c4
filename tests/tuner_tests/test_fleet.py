"""The fleet end to end on the CPU (``--device cpu``, Triton's interpreter, tiny shapes): workers as real
processes against one SQLite file and one PostgreSQL database, a worker killed mid-job, status, and
record mode from a workload to dispatch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import kernels
from db import Store
from db.queue import JobQueue
from tuner.cli import main
from tuner.search import measured_trials, study_name

ROOT = Path(__file__).resolve().parents[2]
CPU = kernels.CPU  # what `--device cpu` resolves to in the workers; this process may run on a GPU
SHAPES = ["16x32x32", "32x16x32", "16x16x32"]
BACKENDS = ["sqlite", "postgresql"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_DB", "TUNER_RECORD")}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, XDG_CACHE_HOME=str(tmp_path / "cache"), TRITON_INTERPRET="1",
               TUNER_DB=f"sqlite:///{tmp_path / 'unused-default.db'}")
    env.update(extra)
    return env


def tuner(tmp_path: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300, **kwargs)


def _measured(url: str, key: str) -> int:
    problem = kernels.Problem.from_key("matmul", key)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.load_study(study_name=study_name(CPU, problem), storage=storage)
    return len(measured_trials(study))


@pytest.mark.parametrize("backend_url", BACKENDS, indirect=True)
@pytest.mark.interpreter
def test_search_on_two_workers_tunes_every_problem_once(backend_url: str, tmp_path: Path) -> None:
    # --gpus 0,1 on the CPU: two worker processes, each given its own CUDA_VISIBLE_DEVICES, share the queue.
    shapes = [arg for shape in SHAPES for arg in ("--shape", shape)]
    done = tuner(tmp_path, "search", "--device", "cpu", "--gpus", "0,1", *shapes, "--trials", "2",
                 "--seed", "0", "--db", backend_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "started 2 worker(s) on GPU(s) 0,1" in done.stdout
    with Store(backend_url) as store:
        queue = JobQueue(store)
        jobs, workers = queue.jobs(), queue.workers()
        records = store.records()
    assert sorted(job.spec.problem_key for job in jobs) == sorted(f"fp16:nn:{s}" for s in SHAPES)
    assert all(job.state == "done" and job.attempts == 1 for job in jobs)
    assert len(workers) == 2 and all(w.state == "stopped" for w in workers)
    assert sum(w.jobs_done for w in workers) == len(SHAPES)
    assert {w.name.rsplit(":", 1)[1] for w in workers} == {"0", "1"}  # each pinned to its GPU
    assert sorted((r.problem_key, r.mode) for r in records) == sorted(
        (f"fp16:nn:{s}", mode) for s in SHAPES for mode in kernels.MODES)
    assert all(_measured(backend_url, f"fp16:nn:{s}") == 2 for s in SHAPES)


def _wait_for(condition, timeout: float = 120.0, explain=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s\n{explain()}"
        time.sleep(0.05)


@pytest.mark.parametrize("backend_url", BACKENDS, indirect=True)
@pytest.mark.interpreter
def test_killed_workers_job_is_finished_by_another_without_repeating_trials(backend_url: str,
                                                                            tmp_path: Path) -> None:
    key, trials = "fp16:nn:16x32x32", 16  # room to kill it mid-study even when its trials run fast
    with Store(backend_url) as store:
        from tuner.fleet import job_specs
        from tuner.search import Budget

        problem = kernels.Problem.from_key("matmul", key)
        JobQueue(store).enqueue(job_specs([problem], CPU, Budget(trials), {"seed": 0}))
    # One storage, made before the worker starts (so the two never race to create Optuna's tables), keeps
    # each poll cheap: a poll that opened a new storage took long enough on a loaded CI machine for the
    # worker to run past a narrow window of trial counts, and the wait then timed out.
    storage = optuna.storages.RDBStorage(backend_url)
    argv = [sys.executable, "-m", "tuner", "worker", "--device", "cpu", "--db", backend_url, "--lease", "2"]
    log = tmp_path / "first-worker.log"
    with log.open("w") as sink:
        first = subprocess.Popen(argv, cwd=ROOT, env=_env(tmp_path), stdout=sink, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: _progress(storage, problem) >= 2, explain=lambda: log.read_text())
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    killed_at = _progress(storage, problem)
    assert killed_at < trials, f"the first worker finished all {trials} trials before it was killed; raise `trials`"
    with Store(backend_url) as store:
        (job,) = JobQueue(store).jobs()
        assert job.state == "running" and store.records() == []  # the dead worker wrote nothing more

    # No --wait: the worker still waits while the dead worker's job runs, until its lease runs out.
    second = tuner(tmp_path, "worker", "--device", "cpu", "--db", backend_url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "attempt 2, resuming its study" in second.stdout
    with Store(backend_url) as store:
        (job,) = JobQueue(store).jobs()
        records = store.records()
    assert job.state == "done" and job.attempts == 2
    assert _measured(backend_url, key) == trials, f"killed after {killed_at}; the budget counts each trial once"
    assert sorted(r.mode for r in records) == sorted(kernels.MODES) and all(r.trials == trials for r in records)


def _progress(storage: optuna.storages.RDBStorage, problem: kernels.Problem) -> int:
    """How many trials of ``problem``'s study are measured so far (0 before the study exists)."""
    name = study_name(CPU, problem)
    if name not in {study.study_name for study in storage.get_all_studies()}:
        return 0
    return len(measured_trials(optuna.load_study(study_name=name, storage=storage)))


def test_status_shows_jobs_and_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with Store(url) as store:
        from tuner.fleet import job_specs
        from tuner.search import Budget

        queue = JobQueue(store)
        problems = [kernels.Problem.from_key("matmul", f"fp16:nn:{s}") for s in SHAPES]
        queue.enqueue(job_specs(problems, CPU, Budget(4), {}))
        queue.beat("hostA:1:0", CPU.name, "hostA", 1, "busy", None, 0)
        job = queue.claim("hostA:1:0", CPU.name)
    assert main(["status", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "3 job(s): 2 queued, 1 running, 0 done, 0 failed" in out
    assert f"#{job.id}  running  cpu  matmul  {job.spec.problem_key}  hostA:1:0  since" in out
    assert "1 worker(s):" in out and "hostA:1:0  cpu  busy  0 done  heartbeat" in out


@pytest.mark.parametrize("backend_url", BACKENDS, indirect=True)
@pytest.mark.interpreter
def test_recorded_workload_is_tuned_then_dispatched(backend_url: str, tmp_path: Path) -> None:
    workload = (
        "import torch, kernels\n"
        "a, b = torch.randn(16, 32, dtype=torch.float16), torch.randn(32, 32, dtype=torch.float16)\n"
        "for _ in range(5): kernels.matmul(a, b)\n"
        "kernels.matmul(torch.randn(32, 32, dtype=torch.float16), b)\n")
    env = _env(tmp_path, TUNER_RECORD="1", TUNER_DB=backend_url)
    for _ in range(2):  # two processes record into one database: their counts add up
        ran = subprocess.run([sys.executable, "-c", workload], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=300)
        assert ran.returncode == 0, ran.stderr

    listed = tuner(tmp_path, "list", "--untuned", "--db", backend_url)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [(row[2], row[3]) for row in rows] == [("fp16:nn:16x32x32", "10"), ("fp16:nn:32x32x32", "2")]

    done = tuner(tmp_path, "search", "--recorded", "--device", "cpu", "--trials", "2", "--seed", "0",
                 "--db", backend_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.index("16x32x32") < done.stdout.index("32x32x32")  # the most work first
    assert "no recorded problem is left untuned" in tuner(tmp_path, "list", "--untuned", "--db", backend_url).stdout

    kernels.use_database(backend_url)
    try:
        choice = kernels.explain("matmul", kernels.Problem.from_key("matmul", "fp16:nn:16x32x32"), CPU)
    finally:
        kernels.use_database(None)
    assert choice.source == "database"


@pytest.mark.interpreter
def test_problems_file_lists_every_bad_line_and_creates_no_database(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "model.txt"
    listing.write_text("# a model's GEMMs\nmatmul fp16:nt:16x32x32 3.5\nmatmul fp16:nn:16x32\n"
                       "conv fp16:nn:1x1x1\nmatmul fp16:nn:8x8x8 many\n")
    db = tmp_path / "never.db"
    assert main(["search", "--device", "cpu", "--problems", str(listing), "--db", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert "3 bad line(s)" in err and "line 3" in err and "line 4" in err and "line 5" in err
    assert not db.exists()


@pytest.mark.interpreter
def test_jobs_with_and_without_eager_passes_are_tuned(tmp_path: Path) -> None:
    """A job queued now carries eager_passes to tune_problem; one queued by a version before the option (no
    such key) gets tune_problem's default. Both finish, in this process's worker loop."""
    from tuner.fleet import WorkerHooks, job_specs, run_worker
    from tuner.search import Budget

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    new, old = (kernels.Problem.from_key("matmul", key) for key in ("fp16:nn:16x32x32", "fp16:nn:32x16x32"))
    with Store(url) as store:
        queue = JobQueue(store)
        queue.enqueue(job_specs([new], CPU, Budget(2), {"seed": 0, "eager_passes": 2}))
        queue.enqueue(job_specs([old], CPU, Budget(2), {"seed": 0}))
        run_worker(store, CPU, lease_s=30, hooks=WorkerHooks())
        jobs = {job.spec.problem_key: job for job in queue.jobs()}
        assert jobs[new.key].spec.options["eager_passes"] == 2 and "eager_passes" not in jobs[old.key].spec.options
        assert all(job.state == "done" for job in jobs.values()), [(j.spec.problem_key, j.state) for j in jobs.values()]
        assert {(r.problem_key, r.mode) for r in store.records()} == {(p.key, m) for p in (new, old) for m in kernels.MODES}


@pytest.mark.interpreter
def test_search_on_gpus_stops_its_workers_once_its_own_jobs_are_finished(tmp_path: Path) -> None:
    # The workers start before the run enqueues (their start-up overlaps its own) and wait for jobs, so the run
    # stops them when its jobs are done. A job another run queued is not this run's: it stays queued, no
    # attempt counted, even where a worker had claimed it before it was stopped.
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with Store(url) as store:
        from tuner.fleet import job_specs
        from tuner.search import Budget

        other = kernels.Problem.from_key("matmul", "fp16:nn:32x32x32")
        JobQueue(store).enqueue(job_specs([other], CPU, Budget(500), {"seed": 0}, priorities=[-1.0]))
    done = tuner(tmp_path, "search", "--device", "cpu", "--gpus", "0,1", "--shape", SHAPES[0], "--shape", SHAPES[1],
                 "--trials", "2", "--seed", "0", "--db", url)
    assert done.returncode == 0, done.stdout + done.stderr
    with Store(url) as store:
        queue = JobQueue(store)
        jobs = {job.spec.problem_key: job for job in queue.jobs()}
        workers = queue.workers()
    assert all(jobs[f"fp16:nn:{s}"].state == "done" for s in SHAPES[:2])
    assert (jobs["fp16:nn:32x32x32"].state, jobs["fp16:nn:32x32x32"].attempts) == ("queued", 0)
    assert len(workers) == 2 and all(w.state == "stopped" for w in workers), workers
    assert "worker exit codes" not in done.stdout


def test_a_user_kernels_keys_are_tuned_by_the_fleet_each_once(tmp_path: Path) -> None:
    # kernels.autotune kernels through the queue: each key a job (kernel MODULE:NAME, problem the key's text),
    # claimed by two worker processes; each key stored once, under the kernel's name.
    import json

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps([{"n": n, "dtypes": ["float32", "float32"]} for n in (20, 24, 40)]))
    target = "tests.autotune_tests._kernels:space_kernel"
    done = tuner(tmp_path, "search", "--device", "cpu", "--gpus", "0,1", "--kernel", target, "--problems", str(keys),
                 "--trials", "3", "--seed", "0", "--db", url)
    assert done.returncode == 0, done.stdout + done.stderr
    with Store(url) as store:
        queue = JobQueue(store)
        jobs, workers = queue.jobs(), queue.workers()
        records = store.records()
    assert sorted(job.spec.problem_key for job in jobs) == [f"n={n};float32,float32" for n in (20, 24, 40)]
    assert all(job.spec.kernel == target and job.state == "done" and job.attempts == 1 for job in jobs), jobs
    assert sorted(r.problem_key.split("@")[0] for r in records) == [f"n={n};float32,float32" for n in (20, 24, 40)]
    # Both workers take jobs as soon as the run lets them go; on a loaded machine one may finish the three tiny keys
    # before the other is through its start-up, and the run then stops that one before it registers.
    assert 1 <= len(workers) <= 2 and sum(w.jobs_done for w in workers) == 3
    assert {w.name.rsplit(":", 1)[1] for w in workers} <= {"0", "1"}


def test_claim_priorities_keep_the_weights_order_and_put_the_largest_first_within_one() -> None:
    from tuner.fleet import claim_priorities

    problems = [kernels.Problem.from_key("matmul", key) for key in
                ("fp16:nn:16x32x32", "fp16:nn:64x32x32", "fp16:nn:32x32x32", "fp16:nn:8x32x32")]
    priorities = claim_priorities(problems, [1.0, 1.0, 5.0, 0.25])
    # Integer parts: the weights' places (0.25, 1, 5 -> 0, 1, 2), which a claim keeps; below them, size.
    assert [int(p) for p in priorities] == [1, 1, 2, 0]
    assert priorities[1] > priorities[0]  # 64 rows before 16 within weight 1
    assert all(0 < p - int(p) < 1 for p in priorities)
    # a recorded workload's shares of work, however small, stay in their order
    shares = claim_priorities(problems, [0.002, 0.5, 0.1, 0.0])
    assert sorted(range(4), key=lambda i: -shares[i]) == [1, 2, 0, 3]
