"""scripts/gpu_session.sh's out-of-box stage: every part of the corpus in turn, each with a fresh database, until
its budget is spent, and every run's files in one tarball (the device tool brings back a limited number of files).

The GPU benchmark cannot run on this machine: a stand-in ``python3`` first on PATH answers for
scripts/bench_dispatch.py (it writes its arguments and a summary line, and fails for the biased q/k/v) and hands
every other call to this interpreter. The stage's shell logic, its budget and its tarball are the real ones."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STAND_IN = f"""#!/bin/bash
if [ "$1" = scripts/bench_dispatch.py ]; then
    shift; echo "args: $*"; echo "graph: geomean 1.000x cuBLAS over 3 (stand-in)"
    case "$*" in *matmul_bias*) exit 3 ;; esac
    exit 0
fi
exec {sys.executable} "$@"
"""

RUNS = ("held_out", "held_out__qkv", "unseen__qkv", "unseen__dtype_bf16", "unseen__dtype_fp16",
        "unseen__kernel_gated_matmul", "unseen__kernel_matmul_bias")


def _stage(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python3").write_text(STAND_IN)
    (shim / "python3").chmod(0o755)
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), "out-of-box"], cwd=ROOT,
                          env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "OUT": str(out), **env},
                          capture_output=True, text=True, timeout=120)
    return done, out


def test_out_of_box_runs_every_part_with_a_fresh_database_and_tars_the_files(tmp_path: Path) -> None:
    done, out = _stage(tmp_path, OOB_BUDGET="120")
    assert done.returncode == 0, done.stderr
    folder = out / "out-of-box"
    assert sorted(path.stem for path in folder.glob("*.txt")) == sorted(RUNS)
    bf16 = (folder / "unseen__dtype_bf16.txt").read_text()
    assert "args: --corpus unseen --dtype bf16 --db sqlite:////tmp/out-of-box-unseen__dtype_bf16.db" in bf16
    assert "--modes graph,eager" in bf16 and "--confirm 0.98" in bf16 and "--no-shipped" not in bf16
    assert "args: --corpus held_out --db" in (folder / "held_out.txt").read_text()
    assert "unseen__kernel_matmul_bias: stopped (exit 3)" in (folder / "unseen__kernel_matmul_bias.txt").read_text()
    log = (out / "out-of-box.log").read_text()
    assert log.count("geomean 1.000x") == len(RUNS) and "== unseen__kernel_gated_matmul" in log
    with tarfile.open(out / "out-of-box.tgz") as tar:
        assert {f"out-of-box/{run}.txt" for run in RUNS} <= set(tar.getnames())


def test_out_of_box_stops_starting_runs_once_its_budget_is_spent(tmp_path: Path) -> None:
    done, out = _stage(tmp_path, OOB_BUDGET="10")
    assert done.returncode == 0, done.stderr
    log = (out / "out-of-box.log").read_text()
    assert all(f"{run}: not run, the budget is spent" in log for run in RUNS)
    assert not list((out / "out-of-box").glob("*.txt"))


def test_out_of_box_can_leave_the_shipped_table_out(tmp_path: Path) -> None:
    done, out = _stage(tmp_path, OOB_BUDGET="120", NO_SHIPPED="1")
    assert done.returncode == 0, done.stderr
    assert "--corpus held_out --no-shipped --db" in (out / "out-of-box" / "held_out.txt").read_text()
