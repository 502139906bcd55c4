"""A job whose candidates fault the GPU, worked off by real worker processes: the job is handed on at once
with its reason, the faulted GPU gets a fresh worker, the other jobs finish, and after ``MAX_ATTEMPTS`` the job
fails saying why.

The kernel is tests/tuner_tests/faulting_kernel.py, loaded by the workers through ``TUNER_IMPORT``. On the
GPU its candidates store to an illegal address. On the CPU no store can fault a device, so there they raise
PyTorch's error for one (the module says so); the fleet's handling of it is the same code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from db import Store
from db.queue import MAX_ATTEMPTS, JobQueue
from tests.tuner_tests import faulting_kernel

ROOT = Path(__file__).resolve().parents[2]
GOOD = ("16x32x32", "32x16x32")
FAULTING = f"{faulting_kernel.FAULTING_M}x32x32"


def _search(tmp_path: Path, url: str, *extra: str, gpu: bool) -> subprocess.CompletedProcess:
    problems = tmp_path / "problems.txt"
    problems.write_text("".join(f"{faulting_kernel.NAME} fp16:nn:{shape}\n" for shape in (*GOOD, FAULTING)))
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_DB", "TUNER_RECORD")}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, TUNER_IMPORT="tests.tuner_tests.faulting_kernel",
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    if not gpu:
        env["TRITON_INTERPRET"] = "1"
    device = [] if gpu else ["--device", "cpu"]
    argv = [sys.executable, "-m", "tuner", "search", *device, "--gpus", "0,1", "--problems", str(problems),
            "--trials", "2", "--seed", "0", "--lease", "30", "--db", url, *extra]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _jobs(url: str) -> dict[str, object]:
    with Store(url) as store:
        return {job.spec.problem_key: job for job in JobQueue(store).jobs()}, store.records()


def _assert_good_jobs_done_once(jobs: dict, records: list) -> None:
    for shape in GOOD:
        job = jobs[f"fp16:nn:{shape}"]
        assert (job.state, job.attempts) == ("done", 1), job
    assert sorted((r.problem_key, r.mode) for r in records) == sorted(
        (f"fp16:nn:{s}", mode) for s in GOOD for mode in kernels.MODES)


@pytest.mark.interpreter
def test_a_job_that_faults_every_worker_is_handed_on_and_fails_with_the_reason(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    done = _search(tmp_path, url, gpu=False)
    out = done.stdout + done.stderr
    jobs, records = _jobs(url)
    _assert_good_jobs_done_once(jobs, records)
    faulted = jobs[f"fp16:nn:{FAULTING}"]
    assert (faulted.state, faulted.attempts) == ("failed", MAX_ATTEMPTS), out
    assert f"faulted the GPU on {MAX_ATTEMPTS} attempts" in faulted.error and "illegal memory access" in faulted.error
    # Each fault ended its worker (exit 75) and the run started a fresh one on that GPU while jobs were left.
    assert out.count("stopped after a GPU fault; starting a fresh one") >= MAX_ATTEMPTS - 1, out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("pool", ["in-process", "compile-workers"])
def test_on_two_gpus_a_faulting_job_fails_with_its_reason_and_the_rest_finish(pool: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    done = _search(tmp_path, url, *(["--workers", "0"] if pool == "in-process" else []), gpu=True)
    out = done.stdout + done.stderr
    jobs, records = _jobs(url)
    _assert_good_jobs_done_once(jobs, records)
    faulted = jobs[f"fp16:nn:{FAULTING}"]
    assert faulted.state == "failed", out
    if pool == "in-process":
        # The fault broke the fleet worker's own CUDA context: handed on, retried on a fresh worker, failed.
        assert faulted.attempts == MAX_ATTEMPTS, out
        assert "illegal memory access" in faulted.error and f"on {MAX_ATTEMPTS} attempts" in faulted.error
    else:
        # Checked and timed in worker processes of their own, the faulting candidates cost only those: the
        # fleet worker lives on, and the job fails once, saying no candidate survived.
        assert faulted.attempts == 1 and "crashed" in faulted.error, (faulted.error, out)
