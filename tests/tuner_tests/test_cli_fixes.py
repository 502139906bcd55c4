"""The command line refuses bad flags and empty or conflicting selections before it creates anything, and a
search run again takes its new budget: each a real ``python -m tuner`` process on real SQLite files."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import kernels
from db import Store
from db.queue import JobQueue, JobSpec
from kernels import _device
from tuner.fleet import job_specs
from tuner.search import optuna_storage
from tuner import fleet_commands
from tuner.search import Budget, measured_trials, open_study

ROOT = Path(__file__).resolve().parents[2]
# Not resolve_device("cpu"): that refuses without TRITON_INTERPRET, and a GPU run of `-m gpu` collects this file.
CPU = _device.CPU
SHAPE = "16x32x32"
KEY = f"fp16:nn:{SHAPE}"


def tuner(tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_DB",)}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, XDG_CACHE_HOME=str(tmp_path / "cache"), TRITON_INTERPRET="1",
               TUNER_DB=f"sqlite:///{tmp_path / 'unused-default.db'}")
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _refused(done: subprocess.CompletedProcess, message: str) -> None:
    """Exit 2 with one ``error:`` line holding ``message``, and no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def _created(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.endswith((".db", ".db-wal", ".db-shm")))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> str:
    """A database with one matmul problem tuned on the CPU by the CLI."""
    tmp = tmp_path_factory.mktemp("tuned")
    url = f"sqlite:///{tmp / 'tuned.db'}"
    done = tuner(tmp, "search", "--device", "cpu", "--shape", SHAPE, "--trials", "2", "--seed", "0", "--db", url)
    assert done.returncode == 0, done.stderr[-2000:]
    return url


# 1. A search run again takes its new budget and options --------------------------------------------------

@pytest.mark.interpreter
def test_search_again_gives_a_still_queued_problem_the_new_trials_and_seed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    problem = kernels.Problem.from_key("matmul", KEY)
    with Store(url) as store:  # an earlier search asked for 500 trials and was stopped before its worker claimed it
        JobQueue(store).enqueue(job_specs([problem], CPU, Budget(500), {"sampler": "tpe", "seed": 0}))
    done = tuner(tmp_path, "search", "--device", "cpu", "--shape", SHAPE, "--trials", "2", "--seed", "3",
                 "--db", url, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    with Store(url) as store:
        [job] = JobQueue(store).jobs()
        study = open_study(optuna_storage(url), CPU, problem, "tpe", 3)
        assert (job.state, job.spec.budget_trials, job.spec.options["seed"]) == ("done", 2, 3)
        assert len(measured_trials(study)) == 2


def test_search_says_which_problem_another_worker_keeps_tuning_to_its_old_budget(tmp_path: Path, capsys) -> None:
    old = JobSpec(CPU.name, "matmul", KEY, 500, None, {"seed": 0})
    new = JobSpec(CPU.name, "matmul", KEY, 2, None, {"seed": 3})
    with Store(f"sqlite:///{tmp_path / 't.db'}") as store:
        queue = JobQueue(store)
        queue.enqueue([old])
        queue.claim("other-host", CPU.name, lease_s=600)
        queue.enqueue([new])
        fleet_commands._say_which_kept_their_budget(queue, [new])
    out = capsys.readouterr().out
    assert f"matmul {KEY} is being tuned by other-host" in out and "500 trials" in out


# 2, 3, 6. Flags are checked before the database is opened -----------------------------------------------

@pytest.mark.parametrize("args, message", [
    pytest.param(["--gpus", "all"], "--gpus all found no GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")),
    (["--seed", "-1"], "--seed -1 must be an integer from 0 to 4294967295"),
    pytest.param(["--sampler", "gp"], "--sampler gp needs the scipy package",
                 marks=pytest.mark.skipif(importlib.util.find_spec("scipy") is not None, reason="scipy is here")),
    (["--lease", "-5"], "--lease -5: give the seconds"),
    (["--lease", "0"], "--lease 0: give the seconds"),
    (["--lease", "nan"], "--lease nan: give the seconds"),
    (["--budget", "nans"], "--budget 'nans' must be a positive number"),
    (["--budget", "infs"], "--budget 'infs' must be a positive number"),
    (["--timeout", "-5"], "--timeout -5 must be a finite number of seconds above 0"),
    (["--timeout", "0"], "--timeout 0 must be a finite number of seconds above 0"),
])
def test_bad_search_flag_exits_2_naming_it_and_creates_nothing(args, message, tmp_path: Path) -> None:
    done = tuner(tmp_path, "search", "--device", "cpu", "--shape", SHAPE, "--trials", "1", *args,
                 "--db", f"sqlite:///{tmp_path / 'never.db'}", timeout=120)
    _refused(done, message)
    assert _created(tmp_path) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_gpus_past_this_hosts_are_refused_after_the_gated_workers_started_and_those_end(tmp_path: Path) -> None:
    # Indices start their workers before torch counts the GPUs (tuner/gpu_workers.py started_early); an index
    # past them is then refused, and the gated worker it started ends without opening the database.
    url = f"sqlite:///{tmp_path / 'never.db'}"
    done = tuner(tmp_path, "search", "--shape", SHAPE, "--trials", "1", "--gpus", "3", "--db", url, timeout=120)
    _refused(done, "this process sees 0 GPU(s), numbered from 0, so 3 is not one")
    deadline = time.monotonic() + 60
    while _processes_naming(url) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_naming(url) == [], "the gated worker outlived the run that refused its GPU"
    assert _created(tmp_path) == []


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # it ended while we looked
            pass
    return found


@pytest.mark.parametrize("lease", ["-5", "0", "inf"])
def test_worker_with_a_bad_lease_exits_2_and_creates_nothing(lease: str, tmp_path: Path) -> None:
    done = tuner(tmp_path, "worker", "--device", "cpu", "--lease", lease, "--db", f"sqlite:///{tmp_path / 'n.db'}")
    _refused(done, f"--lease {lease}: give the seconds")
    assert _created(tmp_path) == []


def test_a_budget_of_no_time_or_of_nan_seconds_is_a_value_error() -> None:
    for seconds in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="seconds must be a finite number above 0"):
            Budget(1, seconds)
    with pytest.raises(ValueError, match="trials must be at least 1"):
        Budget(0)


# 4. list and export match --device and --kernel as the database holds them ---------------------------------

@pytest.mark.interpreter
def test_list_matches_the_device_in_any_case(tuned: str, tmp_path: Path) -> None:
    done = tuner(tmp_path, "list", "--device", "CPU", "--kernel", "MatMul", "--db", tuned)
    assert done.returncode == 0 and KEY in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("args, message", [
    (["--device", "h10"], "--device h10: no records of that GPU"),
    (["--kernel", "conv"], "--kernel conv: no such kernel"),
    (["--kernel", "grouped_matmul"], "no record in"),
])
@pytest.mark.interpreter
def test_export_of_no_matching_record_exits_2_and_leaves_the_file(args, message, tuned: str, tmp_path: Path) -> None:
    keep = tmp_path / "keep.json"
    keep.write_text('{"mine": true}\n')
    done = tuner(tmp_path, "export", *args, "-o", str(keep), "--db", tuned)
    _refused(done, message)
    assert keep.read_text() == '{"mine": true}\n'
    if args[0] == "--device":
        assert "cpu (cpu)" in done.stderr  # the devices that have records


@pytest.mark.interpreter
def test_export_matches_the_device_and_kernel_in_any_case(tuned: str, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = tuner(tmp_path, "export", "--device", "CPU", "--kernel", "MATMUL", "-o", str(out), "--db", tuned)
    assert done.returncode == 0, done.stderr
    assert {r["problem_key"] for r in json.loads(out.read_text())["records"]} == {KEY}


# 5. --problems gets --shape's checks; explain refuses a problem with no work -----------------------------

@pytest.mark.parametrize("line, message", [
    ("matmul fp16:nn:0x0x0", "has no work"),
    ("matmul fp16:nn:0x32x32", "has no work"),
    ("matmul fp16:nn:16777217x16x16", "beyond the sizes a record may hold"),
    ("matmul fp16:nn:16x32x32 nan", "weight nan must be a number from 0 to 1e+12"),
    ("matmul fp16:nn:16x32x32 -2", "weight -2 must be a number from 0 to 1e+12"),
    ("matmul fp16:nn:16x32x32 inf", "weight inf must be a number from 0 to 1e+12"),
    ("matmul fp16:nn:16x32x32 1e308", "weight 1e308 must be a number from 0 to 1e+12"),
])
def test_problems_file_line_refused_as_shape_would_be(line: str, message: str, tmp_path: Path) -> None:
    listing = tmp_path / "model.txt"
    listing.write_text(line + "\n")
    done = tuner(tmp_path, "search", "--device", "cpu", "--problems", str(listing), "--trials", "1",
                 "--db", f"sqlite:///{tmp_path / 'never.db'}", timeout=120)
    _refused(done, message)
    assert _created(tmp_path) == []


def test_explain_refuses_a_problem_with_no_work(tmp_path: Path) -> None:
    done = tuner(tmp_path, "explain", "--device", "h100", "bf16:nt:0x4096x4096")
    _refused(done, "'bf16:nt:0x4096x4096' has no work")


# 7. Conflicting or empty selections ----------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--problems", "LISTING", "--shape", SHAPE], "--problems names the problems to tune, and --shape would be"),
    (["--problems", "LISTING", "--corpus", "tuned"], "and --corpus would be ignored"),
    (["--problems", "LISTING", "--kernel", "matmul"], "and --kernel would be ignored"),
    (["--recorded", "--shape", SHAPE], "--recorded names the problems to tune, and --shape would be"),
    (["--corpus", "tuned", "--dtype", "int8"], "--corpus tuned has no problem of --dtype int8"),
    (["--problems", "EMPTY"], "lists no problem"),
])
def test_conflicting_or_empty_selection_exits_2_and_creates_nothing(args, message, tmp_path: Path) -> None:
    (tmp_path / "model.txt").write_text(f"matmul {KEY}\n")
    (tmp_path / "empty.txt").write_text("# nothing yet\n")
    files = {"LISTING": str(tmp_path / "model.txt"), "EMPTY": str(tmp_path / "empty.txt")}
    done = tuner(tmp_path, "search", "--device", "cpu", "--trials", "1", *[files.get(a, a) for a in args],
                 "--db", f"sqlite:///{tmp_path / 'never.db'}", timeout=120)
    _refused(done, message)
    assert _created(tmp_path) == []


def test_recorded_with_nothing_recorded_creates_no_database(tmp_path: Path) -> None:
    done = tuner(tmp_path, "search", "--device", "cpu", "--recorded", "--db", f"sqlite:///{tmp_path / 'never.db'}")
    assert done.returncode == 0 and "nothing recorded" in done.stdout, done.stdout + done.stderr
    assert _created(tmp_path) == []


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_stamp_refuses_a_wait_that_is_not_a_finite_number_of_seconds(value: str, tmp_path: Path) -> None:
    """nan compared false with 0 and switched the host-speed wait off without a word."""
    done = tuner(tmp_path, "stamp", "--settle-s", value, "--db", f"sqlite:///{tmp_path / 'never.db'}")
    _refused(done, f"--settle-s {float(value)}: give the seconds a timing may wait for the host, a finite number")
    assert _created(tmp_path) == []


@pytest.mark.parametrize("command", [["search", "--device", "cpu", "--corpus", "held_out"],
                                     ["explain", "--device", "h100", "--corpus", "unseen"]])
@pytest.mark.interpreter
def test_corpus_outside_a_checkout_says_where_the_corpus_lives(command, tmp_path: Path) -> None:
    """An installed package has kernels/, tuner/ and db/ (pyproject's packages) but not benchmarks/: the
    packages are copied alone, as pip would install them, and run from there."""
    site = tmp_path / "site"
    for package in ("kernels", "tuner", "db"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "tuner", *command, "--db", f"sqlite:///{tmp_path / 'never.db'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is part of a triton-tuner checkout (benchmarks/corpus/)" in done.stderr
    assert "--problems FILE" in done.stderr
    assert not (tmp_path / "never.db").exists()
